/*
 * fortran/gcomm_fortran.c - the C side of the Fortran module (fortran/gcomm_mod.F90).
 *
 * A Fortran MPI communicator is an integer handle (`integer`, or the MPI_VAL of `type(MPI_Comm)`),
 * which only C can turn into an MPI_Comm (MPI_Comm_f2c); everything else the module binds
 * directly to gcomm.h's functions through iso_c_binding.
 */
#include "gcomm.h"

/* gcommCommInitMPI for a Fortran communicator handle. */
gcommResult_t gcommCommInitMPIF(gcommComm_t* comm, MPI_Fint fcomm, const gcommConfig_t* config);

gcommResult_t gcommCommInitMPIF(gcommComm_t* comm, MPI_Fint fcomm, const gcommConfig_t* config) {
  return gcommCommInitMPI(comm, MPI_Comm_f2c(fcomm), config);
}
